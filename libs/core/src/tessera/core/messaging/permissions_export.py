"""The NATS permissions of the Helm chart's users, made from :mod:`tessera.core.messaging.permissions`.

The chart cannot run Python, so it reads them from ``helm/tessera/files/nats-permissions.json``,
checked in; a test keeps the file equal to what this module makes. Write it again after changing
the permission table::

    uv run --frozen python -m tessera.core.messaging.permissions_export > helm/tessera/files/nats-permissions.json

Operators of their own NATS server read the same file to give each service's user
(``tessera-<service>``) its permissions.
"""

from __future__ import annotations

import json

from tessera.core.messaging.permissions import TRAFFIC, service_permissions, tenant_permissions

#: stands for the tenant's name in the tenant's permissions; the chart replaces it per tenant
TENANT_PLACEHOLDER = "TENANT"


def chart_document() -> dict[str, object]:
    """Each service's permissions, and a tenant publisher's with :data:`TENANT_PLACEHOLDER`."""
    return {
        "services": {service: service_permissions(service).to_config() for service in sorted(TRAFFIC)},
        "tenant": tenant_permissions(TENANT_PLACEHOLDER).to_config(),
    }


def render() -> str:
    return json.dumps(chart_document(), indent=2) + "\n"


def main() -> None:
    print(render(), end="")


if __name__ == "__main__":
    main()
