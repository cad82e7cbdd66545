"""Pages checked in headless Chromium: the run report and the documentation site."""
