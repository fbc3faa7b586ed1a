"""Built-in backend plugins. Each module is a pluggy plugin registered through the
``xkernels.backends`` entry-point group, exactly as a third-party plugin is."""
