"""Who may call (tokens, tenants, quotas) and the audit log of what they did."""
