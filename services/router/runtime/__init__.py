"""The router's model runtime: decision-model deployments (classifiers, embedding models,
cross-encoders) served by managed or attached workers that speak vLLM's pooling API."""
