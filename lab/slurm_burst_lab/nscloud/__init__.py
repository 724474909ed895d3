"""A cloud whose VMs are Linux namespaces: the lab's provider, behind a libcloud driver."""
