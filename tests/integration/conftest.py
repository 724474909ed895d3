"""The provider fixtures (recorded HTTP answers) for this tier's tests."""

from tests.providers import azure, gce, http, openstack  # noqa: F401  (fixtures)
