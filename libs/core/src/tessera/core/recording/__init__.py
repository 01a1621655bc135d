"""Recording consumed events as they arrived, for services that will act on them later and for audits.

The pieces follow a service's shape, so each recording service keeps only its wiring: `model` (the pure
`ObservedEvent`), `repository` (the table and its repository), `service_layer` (the unit of work and the
`record` handler) and `wiring` (the retention setting and the service definition)."""
