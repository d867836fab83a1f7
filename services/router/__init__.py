"""The router: the public entry of a deployment; picks a model pool per request, then a replica in it."""
