"""Transports carry a server's messages to the sites: in-process (the default) and Flower.
The run loop picks one; a transport never imports the run loop back."""
