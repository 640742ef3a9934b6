output "bucket" {
  description = "The archive bucket's name."
  value       = aws_s3_bucket.archive.id
}

output "archive_url" {
  description = "ROOT for vakpipe."
  value       = "s3://${aws_s3_bucket.archive.id}/${var.archive_prefix}"
}

output "reports_url" {
  description = "Base of --out for vakpipe."
  value       = "s3://${aws_s3_bucket.archive.id}/${var.reports_prefix}"
}

output "kms_key_arn" {
  description = "The bucket's SSE-KMS key."
  value       = aws_kms_key.archive.arn
}

output "archive_read_policy_arn" {
  description = "Policy: list and read the archive prefix."
  value       = aws_iam_policy.archive_read.arn
}

output "reports_write_policy_arn" {
  description = "Policy: list, read, write and delete under the reports prefix."
  value       = aws_iam_policy.reports_write.arn
}
