"""The HTTP gateway: logins, the API, the event stream (docs/design.md, "The gateway")."""
