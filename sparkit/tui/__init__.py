"""The Textual chat app (`sparkit chat`). Importing this package does not import textual."""
