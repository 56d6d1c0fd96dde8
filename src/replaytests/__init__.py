"""replaytests: does replaying a stored token prefix put the decoder back in the state it reached?"""

__version__ = "0.1.0"
