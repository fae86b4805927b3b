"""TokenReview and SubjectAccessReview for the emulator: answers from tables the test sets up.

Both are create-only and stored nowhere, as on a real API server: the answer is the
posted object with its `status` filled in.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field

from scaler.emulator.store import Obj, ResourceType, StoreError

TOKEN_REVIEWS = ResourceType("authentication.k8s.io", "v1", "tokenreviews", "TokenReview",
                             namespaced=False)
ACCESS_REVIEWS = ResourceType("authorization.k8s.io", "v1", "subjectaccessreviews",
                              "SubjectAccessReview", namespaced=False)
TYPES = (TOKEN_REVIEWS, ACCESS_REVIEWS)


@dataclass(frozen=True, slots=True)
class Grant:
    """One RBAC-like rule: `subject` (a username, or a group such as system:authenticated)
    may do `verbs` on `resources` of `api_group` in `namespace`, or `get` the non-resource
    `paths` (shell patterns: "/apis/*"). "*" matches anything."""

    subject: str
    verbs: tuple[str, ...] = ("*",)
    api_group: str = "*"
    resources: tuple[str, ...] = ("*",)
    namespace: str = "*"
    paths: tuple[str, ...] = ()

    def allows(self, spec: Obj) -> bool:
        subjects = {spec.get("user", ""), *(spec.get("groups") or ())}
        if self.subject not in subjects:
            return False
        resource = spec.get("resourceAttributes")
        if resource is not None:
            return (not self.paths and _any(self.verbs, resource.get("verb", ""))
                    and self.api_group in ("*", resource.get("group", ""))
                    and _any(self.resources, resource.get("resource", ""))
                    and self.namespace in ("*", resource.get("namespace", "")))
        path = (spec.get("nonResourceAttributes") or {}).get("path", "")
        verb = (spec.get("nonResourceAttributes") or {}).get("verb", "")
        return _any(self.verbs, verb) and any(fnmatch.fnmatchcase(path, p) for p in self.paths)


def _any(allowed: tuple[str, ...], value: str) -> bool:
    return "*" in allowed or value in allowed


@dataclass(slots=True)
class Reviews:
    """tokens: bearer token -> the UserInfo a TokenReview returns ({"username": ...,
    "groups": [...]}); any other token is not authenticated. grants: who may do what."""

    tokens: dict[str, Obj] = field(default_factory=dict)
    grants: list[Grant] = field(default_factory=list)

    def review(self, rtype: ResourceType, body: Obj) -> Obj:
        spec = body.get("spec")
        if not isinstance(spec, dict):
            raise StoreError(422, "Invalid", "spec: Required value")
        answer = {**body, "apiVersion": rtype.api_version, "kind": rtype.kind,
                  "metadata": body.get("metadata") or {}}
        if rtype == TOKEN_REVIEWS:
            user = self.tokens.get(str(spec.get("token", "")))
            answer["status"] = ({"authenticated": True, "user": user} if user is not None
                                else {"authenticated": False, "error": "invalid token"})
        else:
            allowed = any(grant.allows(spec) for grant in self.grants)
            answer["status"] = {"allowed": allowed,
                                "reason": "granted by the emulator's table" if allowed
                                else "no grant in the emulator's table"}
        return answer
