"""What the tests share: helpers, child scripts, data."""
