"""The API's routes, one router per resource: `identity` (whoami), `capacity` (status, capacity,
pools), `teams` (teams, reservations), `nodes`, `workloads`, `usage` (cost, usage). Each module's
`router(ctx)` makes its routes over the server's shared `ApiContext`."""
