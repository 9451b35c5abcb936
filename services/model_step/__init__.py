"""model-step: calls the model provider; keeps no state of its own."""
