"""Headless engine service: runs a model backend behind the engine protocol on ZMQ sockets."""
