variable "bucket_name" {
  description = "Name of the archive bucket (globally unique)."
  type        = string
}

variable "archive_prefix" {
  description = "Prefix the session ledgers are archived under (no slashes around it)."
  type        = string
  default     = "archive"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]*$", var.archive_prefix))
    error_message = "One path segment, no slashes."
  }
}

variable "reports_prefix" {
  description = "Prefix vakpipe writes its reports under (no slashes around it)."
  type        = string
  default     = "reports"

  validation {
    condition     = can(regex("^[A-Za-z0-9][A-Za-z0-9._-]*$", var.reports_prefix))
    error_message = "One path segment, no slashes."
  }
}

variable "object_lock_mode" {
  description = <<-EOT
    Default object lock mode. COMPLIANCE: no one, the account root included, can delete
    or overwrite a locked version before its retention ends. GOVERNANCE lets principals
    with s3:BypassGovernanceRetention do so (use it for a first trial, then switch).
  EOT
  type        = string
  default     = "COMPLIANCE"

  validation {
    condition     = contains(["COMPLIANCE", "GOVERNANCE"], var.object_lock_mode)
    error_message = "COMPLIANCE or GOVERNANCE."
  }
}

variable "retention_days" {
  description = "Default retention of every object version (archive and reports alike)."
  type        = number
  default     = 90
}

variable "archive_infrequent_access_after_days" {
  description = <<-EOT
    Days after which archived ledgers move to STANDARD_IA. The nightly audit reads only
    objects that changed since the last night, so old ledgers are rarely read.
  EOT
  type        = number
  default     = 30
}

variable "reports_noncurrent_days" {
  description = "Days a replaced or deleted report version is kept (after its retention)."
  type        = number
  default     = 30
}

variable "access_log_bucket" {
  description = "Existing bucket that receives the archive bucket's server access logs."
  type        = string
}

variable "job_role_names" {
  description = <<-EOT
    IAM roles (IRSA roles of the job's Kubernetes service account) that get both
    policies: read the archive, write the reports. Created outside this module.
  EOT
  type        = list(string)
  default     = []
}

variable "tags" {
  description = "Tags for every resource."
  type        = map(string)
  default     = {}
}
