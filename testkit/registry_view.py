"""A test's view of a RegistryApp's whole registry, through the verifier's own local reads
(sections.LOCAL_USERS / LOCAL_MODELS): what unit tests compare and assert on. Never a network
answer: nodes ask proven queries (gentorrent.ledger.queries)."""

from __future__ import annotations

from dataclasses import dataclass

from gentorrent.ledger.sections import LOCAL_MODELS, LOCAL_USERS, ModelRecord, UserRecord, decode_models, decode_users


@dataclass(frozen=True)
class Registry:
    height: int
    users: tuple[UserRecord, ...]
    models: tuple[ModelRecord, ...]

    def user(self, node_id: bytes) -> UserRecord | None:
        return next((u for u in self.users if u.node_id == node_id), None)

    def model(self, node_id: bytes) -> ModelRecord | None:
        return next((m for m in self.models if m.node_id == node_id), None)

    def trusted_models(self, model: str | None = None) -> tuple[ModelRecord, ...]:
        return tuple(m for m in self.models if m.trusted and (model is None or m.model == model))


def registry(app) -> Registry:
    users, models = app.query(LOCAL_USERS), app.query(LOCAL_MODELS)
    return Registry(users.height, decode_users(users.value), decode_models(models.value))
