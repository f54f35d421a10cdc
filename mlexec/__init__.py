"""The analyzer: measure the engines on user input, from the command line or the web."""
