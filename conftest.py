# The replaytests plugin itself is registered through the `pytest11` entry point (pyproject.toml);
# pytester drives it in the suite's own tests.
pytest_plugins = ["pytester"]
