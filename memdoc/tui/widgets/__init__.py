"""The dashboard's widgets: each displays one part of a frame and computes nothing itself."""
