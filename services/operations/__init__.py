"""The operator's tools: the `signoff` command line, its console, the supervisor of
`signoff up` with its tool launcher, service users and warm start, and `signoff status`.
They reach a service only through `shared/` or the service's public entry points."""
