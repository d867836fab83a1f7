"""Model backends behind one small port (services.engine.backend.Backend)."""
