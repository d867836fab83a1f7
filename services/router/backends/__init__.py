"""The router's backends: pools of replicas, their health and circuit breakers, the scheduling policies
(policies/), dispatch with retry, the upstream clients, and the KV events that precise prefix reads."""
