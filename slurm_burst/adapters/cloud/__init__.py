"""Cloud adapters: libcloud drivers and the namespace cloud used by the lab."""
