"""JSON Schemas of the configuration models (policies, settings), defaults included.

pydantic leaves a field's default out of the schema when it comes from a
`default_factory` (every nested group and list); calling the factory here puts it back,
so `scaler schema` shows what an omitted `behavior:` or `kube.retry:` means.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import GenerateJsonSchema
from pydantic_core import core_schema

DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _FactoryDefaults(GenerateJsonSchema):
    def get_default_value(self, schema: core_schema.WithDefaultSchema) -> Any:
        factory = schema.get("default_factory")
        if factory is not None and not schema.get("default_factory_takes_data"):
            return factory()  # type: ignore[call-arg]
        return super().get_default_value(schema)


def document(model: type[BaseModel], *, title: str, by_alias: bool) -> dict[str, Any]:
    """The JSON Schema of `model` as written in files (camelCase when `by_alias`)."""
    schema = model.model_json_schema(by_alias=by_alias, schema_generator=_FactoryDefaults)
    schema["$schema"] = DIALECT
    schema["title"] = title
    return schema
