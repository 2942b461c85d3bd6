"""The local server's REST API: JSON codec, endpoints, the ASGI application and its HTTP transport."""
