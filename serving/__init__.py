"""TF Serving's model repository layout, clients and the local serving tools."""
