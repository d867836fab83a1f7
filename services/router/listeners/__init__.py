"""The router's listeners: the ports clients call, access control (API keys), the public APIs' codecs
(codecs/), the OpenAPI document, SSE reading, the ASGI plumbing, and a request's way to a backend and back."""
