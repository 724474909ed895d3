"""Object storage for staged data (libcloud's storage drivers) and the site's side of a
dataset (the files a stage reads)."""
