"""Protocol buffer definitions (mesh.v1) and their generated Python code."""
