"""Attack module: adversarial attacks behind one ``Attack`` interface."""
