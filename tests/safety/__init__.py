"""Nothing lost, nothing trusted blindly: atomic writes, outputs, resume, bounds, untrusted inputs."""
