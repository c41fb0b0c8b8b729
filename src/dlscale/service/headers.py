"""Security headers on every response: a Content-Security-Policy that lets pages load only the
server's own scripts, styles and streams, no MIME sniffing, no Referer sent elsewhere."""

from __future__ import annotations

# Scripts and styles only from /static (no inline ones: an injected <script> does not run), the
# browser talks only to this server, and no other site may frame the dashboard (clickjacking).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; connect-src 'self'; img-src 'self' data:; style-src 'self'; "
    "script-src 'self'; frame-ancestors 'none'"
)
HEADERS = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
)


class SecurityHeaders:
    """ASGI middleware adding HEADERS to each HTTP response; the body passes through untouched
    (the live logs' event streams included), and a route's own value of a header wins."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def with_headers(message):
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                extra = [(name, value) for name, value in HEADERS if name not in present]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        await self.app(scope, receive, with_headers)
