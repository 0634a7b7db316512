"""The schema, one migration per change, run by both dialects.

Each entry moves the schema one version up; never edit a shipped entry,
append a new one. Where the two databases spell a column differently, the
entry names it (``{bigint}``, ``{serial}``, ...) and each dialect's ``TERMS``
says how: SQLite's render every entry to the text it always ran, PostgreSQL's
to the schema its own list used to make (an insertion-order ``seq`` column
where SQLite has its ``rowid``, the counter execution ids are drawn from).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

MIGRATIONS = [
    """
    CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);{counters}
    CREATE TABLE sessions (
        id TEXT PRIMARY KEY,{seq}
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        ended_at TEXT,
        doc TEXT NOT NULL
    );
    CREATE INDEX sessions_open ON sessions (ended_at);
    CREATE TABLE executions (
        id {bigint} PRIMARY KEY,
        session_id TEXT NOT NULL REFERENCES sessions (id),
        execution_count INTEGER,
        status TEXT NOT NULL,
        code TEXT NOT NULL,
        description TEXT,
        outputs TEXT NOT NULL,
        truncated {flag} NOT NULL DEFAULT {false},
        error TEXT,
        started_at TEXT NOT NULL,
        ended_at TEXT NOT NULL,
        duration_ms {real} NOT NULL
    );
    CREATE INDEX executions_by_session ON executions (session_id, id);
    """,
    # What a restarted gateway needs to reattach to a live kernel, and the
    # outputs of executions still running, so a crash loses none of them.
    """
    ALTER TABLE sessions ADD COLUMN runtime TEXT;
    CREATE TABLE running_outputs (
        id {serial} PRIMARY KEY,
        execution_id {bigint} NOT NULL REFERENCES executions (id) ON DELETE CASCADE,
        output TEXT
    );
    CREATE INDEX running_outputs_by_execution ON running_outputs (execution_id, id);
    CREATE INDEX executions_running ON executions (status) WHERE status = 'running';
    """,
    # Who did what, when, to which session, and how it went.
    """
    CREATE TABLE audit (
        id {serial} PRIMARY KEY,
        at TEXT NOT NULL,
        tenant TEXT,
        token_id TEXT,
        action TEXT NOT NULL,
        session_id TEXT,
        outcome TEXT NOT NULL,
        status INTEGER,
        remote TEXT,
        detail TEXT
    );
    CREATE INDEX audit_by_time ON audit (at);
    CREATE INDEX audit_by_session ON audit (session_id, id);
    """,
    # Retention finds executions past their age without reading the table.
    """
    CREATE INDEX executions_by_start ON executions (started_at);
    """,
    # Tenants' sealed secrets: only ciphertext (access.secrets holds the key).
    """
    CREATE TABLE secrets (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        sealed {blob} NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        PRIMARY KEY (tenant, name)
    );
    """,
    # What each execution did to the workspace: created, modified, deleted files.
    """
    ALTER TABLE executions ADD COLUMN files TEXT;
    """,
    # Every connection a session made through the egress proxy, allowed or denied.
    """
    CREATE TABLE connections (
        id {serial} PRIMARY KEY,
        session_id TEXT NOT NULL,
        execution_id {bigint},
        at TEXT NOT NULL,
        record TEXT NOT NULL
    );
    CREATE INDEX connections_by_session ON connections (session_id, id);
    CREATE INDEX connections_by_execution ON connections (execution_id);
    CREATE INDEX connections_by_time ON connections (at);
    """,
    # What the policy made of each execution (findings, decision), and approvals.
    """
    ALTER TABLE executions ADD COLUMN review TEXT;
    CREATE TABLE approvals (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        state TEXT NOT NULL,
        created_at TEXT NOT NULL,
        doc TEXT NOT NULL
    );
    CREATE INDEX approvals_by_state ON approvals (state, created_at);
    """,
    # Snapshots of sessions' kernel state and workspace; they outlive their sessions.
    """
    CREATE TABLE snapshots (
        id TEXT PRIMARY KEY,{seq}
        tenant TEXT NOT NULL,
        session_id TEXT NOT NULL,
        created_at TEXT NOT NULL,
        size_bytes {bigint} NOT NULL,
        doc TEXT NOT NULL
    );
    CREATE INDEX snapshots_by_tenant ON snapshots (tenant);
    CREATE INDEX snapshots_by_session ON snapshots (session_id, created_at);
    """,
    # Which gateway owns each open session, until when (seconds, the database's clock).
    """
    CREATE TABLE leases (
        session_id TEXT PRIMARY KEY,
        owner TEXT NOT NULL,
        expires_at {real} NOT NULL
    );
    CREATE INDEX leases_by_owner ON leases (owner);
    """,
    # Where each gateway sharing the store answers: requests for its sessions go there.
    """
    CREATE TABLE gateways (
        id TEXT PRIMARY KEY,
        address TEXT NOT NULL,
        seen_at {real} NOT NULL
    );
    """,
    # Records chained by hash (chain.py): an entry for each audit event, egress
    # connection and finished execution, in its tenant's chain and its session's,
    # and each chain's head. Rows from before are an unchained prefix: their ids
    # up to the 'unchained:' rows.
    """
    CREATE TABLE chain (
        id {serial} PRIMARY KEY,
        kind TEXT NOT NULL,
        record_id {bigint} NOT NULL,
        tenant TEXT NOT NULL,
        session_id TEXT,
        at TEXT NOT NULL,
        digest TEXT NOT NULL,
        tenant_seq {bigint} NOT NULL,
        tenant_hash TEXT NOT NULL,
        session_seq {bigint},
        session_hash TEXT
    );
    CREATE UNIQUE INDEX chain_by_tenant ON chain (tenant, tenant_seq);
    CREATE UNIQUE INDEX chain_by_session ON chain (session_id, session_seq);
    CREATE INDEX chain_by_record ON chain (kind, record_id);
    CREATE TABLE chain_heads (name TEXT PRIMARY KEY, count {bigint} NOT NULL, hash TEXT NOT NULL);
    INSERT INTO chain_heads SELECT 'unchained:audit', coalesce(max(id), 0), ''
        FROM audit;
    INSERT INTO chain_heads SELECT 'unchained:connections', coalesce(max(id), 0), ''
        FROM connections;
    INSERT INTO chain_heads SELECT 'unchained:executions', coalesce(max(id), 0), ''
        FROM executions;
    """,
    # One view of a deployment: each session's tenant as a column (listings page by it),
    # when each lease was last renewed (how fresh another gateway's session is), and
    # the claims every create makes on its tenant's quota and its host's caps (claims.py),
    # the sessions open at the upgrade claimed as they stand.
    """
    ALTER TABLE sessions ADD COLUMN tenant TEXT;
    UPDATE sessions SET tenant = coalesce({doc_tenant}, 'default');
    CREATE INDEX sessions_open_by_tenant ON sessions (tenant, created_at) WHERE ended_at IS NULL;
    ALTER TABLE leases ADD COLUMN renewed_at {real};
    CREATE TABLE claims (
        session_id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        owner TEXT NOT NULL,
        host TEXT NOT NULL,
        memory {bigint} NOT NULL,
        cpus {real} NOT NULL,
        disk {bigint} NOT NULL,
        claimed_at {real} NOT NULL,
        expires_at {real} NOT NULL,
        released_at {real}
    );
    CREATE INDEX claims_by_tenant ON claims (tenant, claimed_at);
    CREATE INDEX claims_by_host ON claims (host) WHERE released_at IS NULL;
    INSERT INTO claims (session_id, tenant, owner, host, memory, cpus, disk, claimed_at,
        expires_at)
        SELECT id, tenant, '', '', {doc_memory}, {doc_cpus}, {doc_disk}, 0, 0
        FROM sessions WHERE ended_at IS NULL;
    """,
    # Lifecycle webhooks (webhooks.py): one row per event and endpoint, each attempt in
    # its log; claimed by one gateway at a time, in order per session and endpoint.
    """
    CREATE TABLE webhook_deliveries (
        seq {serial} PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        event_id TEXT NOT NULL,
        type TEXT NOT NULL,
        tenant TEXT NOT NULL,
        endpoint TEXT NOT NULL,
        session_id TEXT NOT NULL,
        body TEXT NOT NULL,
        state TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        due_at {real} NOT NULL,
        claimed_by TEXT,
        claimed_until {real},
        created_at {real} NOT NULL,
        finished_at {real},
        log TEXT NOT NULL,
        replay_of TEXT
    );
    CREATE INDEX webhook_deliveries_due ON webhook_deliveries (state, due_at);
    CREATE INDEX webhook_deliveries_by_tenant ON webhook_deliveries (tenant, seq);
    CREATE INDEX webhook_deliveries_in_order
        ON webhook_deliveries (tenant, endpoint, session_id, state);
    """,
    # Webhook deliveries: an endpoint's waiting rows counted (its queue cap) and an endpoint
    # in flight found without reading its whole log; the prune finds old rows by age.
    """
    CREATE INDEX webhook_deliveries_waiting ON webhook_deliveries (tenant, endpoint, state);
    CREATE INDEX webhook_deliveries_by_age ON webhook_deliveries (created_at);
    """,
    # Templates (templates.py): each build of a tenant's template is a version of its name.
    """
    CREATE TABLE templates (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        version INTEGER NOT NULL,
        status TEXT NOT NULL,
        created_at {real} NOT NULL,
        doc TEXT NOT NULL,
        UNIQUE (tenant, name, version)
    );
    """,
    # Named volumes (volumes.py): a tenant's, by name, outliving sessions; a mount holds
    # while its session's quota claim does.
    """
    CREATE TABLE volumes (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        size_bytes {bigint} NOT NULL,
        created_at TEXT NOT NULL,
        doc TEXT NOT NULL,
        UNIQUE (tenant, name)
    );
    CREATE TABLE volume_mounts (
        volume_id TEXT NOT NULL,
        session_id TEXT NOT NULL,
        read_only {flag} NOT NULL,
        PRIMARY KEY (volume_id, session_id)
    );
    CREATE INDEX volume_mounts_by_session ON volume_mounts (session_id);
    """,
    # Templates' tags (templates.py): a tag names one version of a tenant's template.
    """
    CREATE TABLE template_tags (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        tag TEXT NOT NULL,
        build TEXT NOT NULL,
        created_at {real} NOT NULL,
        PRIMARY KEY (tenant, name, tag)
    );
    CREATE INDEX template_tags_by_build ON template_tags (build);
    """,
    # Templates' warm pools (template_pools.py): how many ready sandboxes a tenant keeps.
    """
    CREATE TABLE template_pools (
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        size INTEGER NOT NULL,
        PRIMARY KEY (tenant, name)
    );
    """,
]

LATEST = len(MIGRATIONS)


def pending(version: int, terms: Mapping[str, str]) -> Iterator[tuple[int, str]]:
    """The migrations past ``version``, each as (the version it makes, its SQL in a dialect)."""
    for number, script in enumerate(MIGRATIONS[version:], start=version + 1):
        yield number, script.format_map(terms)
