"""A small OpenID Connect provider the tests run on loopback: its own RSA key, a discovery
document, JWKS, an authorization endpoint (it logs in whoever `next_login` names at once
and redirects back with a code) and a token endpoint that checks the client's secret,
the code, the redirect URL and the PKCE verifier (S256), and answers an ID token signed
with its key. A real HTTP exchange with a real signature: the gateway, another process,
fetches all of it. `tamper` bends the next ID token (an expired one, another audience,
a signature by a key that is not the issuer's)."""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from joserfc import jwt
from joserfc.jwk import KeySet, RSAKey

CLIENT_ID = "signoff-gateway"
CLIENT_SECRET = "a-client-secret-for-the-tests"


class Provider:
    def __init__(self) -> None:
        self.key = RSAKey.generate_key(2048, parameters={"kid": "issuer-key-1", "use": "sig", "alg": "RS256"})
        self.other_key = RSAKey.generate_key(2048, parameters={"kid": "issuer-key-1", "alg": "RS256"})
        self.codes: dict[str, dict[str, Any]] = {}
        # Who the next authorization logs in: the claims beyond iss/aud/exp/iat/nonce.
        self.next_login: dict[str, Any] = {}
        # "expired", "audience", "signature", or "" (a good token).
        self.tamper = ""
        self.token_requests = 0
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                parts = urlsplit(self.path)
                if parts.path == "/.well-known/openid-configuration":
                    return self._json(200, provider.discovery())
                if parts.path == "/jwks":
                    return self._json(200, KeySet([provider.key]).as_dict(private=False))
                if parts.path == "/authorize":
                    query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                    if query.get("client_id") != CLIENT_ID or query.get("code_challenge_method") != "S256":
                        return self._json(400, {"error": "invalid_request"})
                    code = secrets.token_urlsafe(16)
                    provider.codes[code] = query
                    location = query["redirect_uri"] + "?" + urlencode({"code": code, "state": query["state"]})
                    self.send_response(302)
                    self.send_header("Location", location)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return None
                return self._json(404, {"error": "not_found"})

            def do_POST(self) -> None:
                if urlsplit(self.path).path != "/token":
                    return self._json(404, {"error": "not_found"})
                provider.token_requests += 1
                body = self.rfile.read(int(self.headers.get("Content-Length", "0"))).decode()
                form = {k: v[0] for k, v in parse_qs(body).items()}
                expected = "Basic " + base64.b64encode(f"{CLIENT_ID}:{CLIENT_SECRET}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    return self._json(401, {"error": "invalid_client"})
                asked = provider.codes.pop(form.get("code", ""), None)
                verifier = form.get("code_verifier", "")
                challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=")
                if (
                    asked is None
                    or form.get("grant_type") != "authorization_code"
                    or form.get("redirect_uri") != asked["redirect_uri"]
                    or challenge.decode() != asked["code_challenge"]
                ):
                    return self._json(400, {"error": "invalid_grant"})
                return self._json(
                    200, {"access_token": secrets.token_urlsafe(16), "token_type": "Bearer",
                          "id_token": provider.id_token(asked["nonce"])}
                )

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def discovery(self) -> dict[str, Any]:
        return {
            "issuer": self.url,
            "authorization_endpoint": self.url + "/authorize",
            "token_endpoint": self.url + "/token",
            "jwks_uri": self.url + "/jwks",
            "response_types_supported": ["code"],
            "subject_types_supported": ["public"],
            "id_token_signing_alg_values_supported": ["RS256"],
            "code_challenge_methods_supported": ["S256"],
        }

    def id_token(self, nonce: str) -> str:
        now = int(time.time())
        claims = {"iss": self.url, "aud": CLIENT_ID, "iat": now, "exp": now + 300, "nonce": nonce,
                  "sub": "subject-1", **self.next_login}
        key = self.key
        if self.tamper == "expired":
            claims.update(iat=now - 7200, exp=now - 3600)
        elif self.tamper == "audience":
            claims["aud"] = "another-client"
        elif self.tamper == "signature":
            key = self.other_key  # same key id, not the issuer's key
        return jwt.encode({"alg": "RS256", "kid": "issuer-key-1"}, claims, key)

    def __enter__(self) -> Provider:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
