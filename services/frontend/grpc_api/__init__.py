"""The gRPC face (layer 5): the Inference, Control, RlControl and KvEvents services, the API-key check
and the server that assembles them. Takes the FrontendCore; never imports http_api/, its sibling."""
