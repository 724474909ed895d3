"""Cloud adapters: libcloud drivers, provider profiles, host-key attestation, credentials."""
