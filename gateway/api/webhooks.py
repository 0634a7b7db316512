"""Lifecycle webhooks: a tenant's endpoints, its delivery log, and replaying a delivery."""

from __future__ import annotations

from .base import JSONHandler

_ID = r"(?P<delivery_id>[0-9a-f]{32})"


class EndpointsHandler(JSONHandler):
    async def get(self) -> None:
        self.send({"endpoints": self.webhooks.endpoints_of(self.principal)})


class DeliveriesHandler(JSONHandler):
    async def get(self) -> None:
        before = self.get_argument("before", None)
        page = await self.webhooks.deliveries(
            self.principal,
            self.get_argument("state", None),
            None if before is None else self.int_argument("before", 0),
            self.int_argument("limit", 100),
        )
        self.send(page)


class DeliveryHandler(JSONHandler):
    async def get(self, delivery_id: str) -> None:
        self.send(await self.webhooks.delivery(delivery_id, self.principal))


class ReplayHandler(JSONHandler):
    actions = {"POST": "webhook.replay"}

    async def post(self, delivery_id: str) -> None:
        again = await self.webhooks.replay(delivery_id, self.principal)
        self.audit_session = again["session_id"]
        self.audit_detail.update(delivery_id=delivery_id, replay_id=again["id"])
        self.send(again, 202)


routes = [
    (r"/v1/webhooks", EndpointsHandler),
    (r"/v1/webhooks/deliveries", DeliveriesHandler),
    (rf"/v1/webhooks/deliveries/{_ID}", DeliveryHandler),
    (rf"/v1/webhooks/deliveries/{_ID}/replay", ReplayHandler),
]
