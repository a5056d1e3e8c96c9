"""chsink Kopf operator (named sinkoperator so it does not shadow the stdlib operator module)."""
