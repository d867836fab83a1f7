"""The edge library, shared by every face that reads a client's request (the frontend's HTTP and gRPC, the
router's listeners): the JSON depth scan and the API-key rule. Pure: no sockets, no event loop, no threads;
it never imports a service."""
