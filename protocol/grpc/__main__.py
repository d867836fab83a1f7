"""`python -m protocol.grpc [--check | --update]`: the gRPC schema against its lock (lock.py)."""
import sys

from protocol.grpc.lock import main

sys.exit(main())
