"""``GET /metrics``: Prometheus text exposition, for admins (and their scrapers)."""

from __future__ import annotations

from collections import Counter

from .base import JSONHandler


class MetricsHandler(JSONHandler):
    async def get(self) -> None:
        self.require_admin("the metrics endpoint")
        manager = self.manager
        states = Counter(s.state for s in manager.sessions.values())
        lines = [
            "# HELP sbx_sessions Live sessions by state.",
            "# TYPE sbx_sessions gauge",
            *(
                f'sbx_sessions{{state="{k}"}} {states[k]}'
                for k in ("idle", "busy", "dead", "starting")
            ),
            "# HELP sbx_executions_total Finished executions by status.",
            "# TYPE sbx_executions_total counter",
            *(
                f'sbx_executions_total{{status="{k}"}} {v}'
                for k, v in sorted(manager.counts.items())
            ),
            "# HELP sbx_pool_ready Warm kernels ready to be claimed.",
            "# TYPE sbx_pool_ready gauge",
            "# HELP sbx_pool_target Warm kernels the pool keeps.",
            "# TYPE sbx_pool_target gauge",
        ]
        for name, stats in manager.pool.stats().items():
            lines.append(f'sbx_pool_ready{{kernel="{name}"}} {stats["ready"]}')
            lines.append(f'sbx_pool_target{{kernel="{name}"}} {stats["target"]}')
        lines += [
            "# HELP sbx_pool_claims_total Session creates, by whether a warm kernel served them.",
            "# TYPE sbx_pool_claims_total counter",
            *(
                f'sbx_pool_claims_total{{kernel="{kernel}",result="{result}"}} {count}'
                for (kernel, result), count in sorted(manager.pool.claims.items())
            ),
            "# HELP sbx_event_loop_lag_max_seconds Longest event-loop stall in the last minute.",
            "# TYPE sbx_event_loop_lag_max_seconds gauge",
            f"sbx_event_loop_lag_max_seconds {self.settings['sbx_loop_lag'].max_lag():.6f}",
        ]
        self.set_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.finish("\n".join(lines) + "\n")


routes = [(r"/metrics", MetricsHandler)]
