"""A write names only the query parameters its route takes.

``POST /v1/workflows?usr_id=bob`` (a typo) or ``?dry_run=true`` (a wish) would otherwise
change state as if the parameter were not there, and the caller would believe it was
honoured. A write (POST, PUT, PATCH, DELETE) with a query parameter its route does not
declare answers 400 naming it, and changes nothing; a read ignores what it does not take
(cache-busting parameters, tracking tags), as reads on the web do.
"""

from __future__ import annotations

from fastapi import Request
from fastapi.routing import APIRoute

from state.errors import BadInputError

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _names(route: APIRoute) -> set[str]:
    """The query parameters ``route`` declares, its dependencies' included (a walk of a
    few nodes, on writes only)."""
    found: set[str] = set()
    pending = [route.dependant]
    while pending:
        dependant = pending.pop()
        found.update(param.alias for param in dependant.query_params)
        pending.extend(dependant.dependencies)
    return found


async def known_query_parameters(request: Request) -> None:
    """Refuse a write's query parameter that its route does not declare."""
    route = request.scope.get("route")
    if request.method not in WRITES or not isinstance(route, APIRoute):
        return
    declared = _names(route)
    unknown = sorted(set(request.query_params) - declared)
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        takes = ", ".join(sorted(declared)) or "none"
        raise BadInputError(
            f"unknown query parameter {names} for {request.method} {route.path} "
            f"(it takes: {takes}); nothing was changed"
        )
