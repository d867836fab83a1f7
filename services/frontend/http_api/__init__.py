"""The HTTP face (layer 5): the ASGI app and its routes, the lean generation path's ASGI plumbing, the
response writer, the OpenAI response bodies, render and the OpenAPI document. Takes the FrontendCore;
never imports grpc_api/, its sibling."""
