"""What runs on a cloud node: the bootstrap script the provisioner copies over SSH and
runs one step at a time (``sh bootstrap.sh STEP ARGS...``)."""
