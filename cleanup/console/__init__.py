"""The operator console: the Django admin's pages and actions over the ledger."""
