"""Infrastructure of vakpipe: Terraform for AWS (``terraform/``), a local copy (``local``)."""
