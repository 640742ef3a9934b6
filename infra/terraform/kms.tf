data "aws_caller_identity" "current" {}
data "aws_partition" "current" {}
data "aws_region" "current" {}

locals {
  account_root = "arn:${data.aws_partition.current.partition}:iam::${data.aws_caller_identity.current.account_id}:root"
  # SSE-KMS requests reach KMS through S3 only; the job's policies are limited to that.
  s3_service = "s3.${data.aws_region.current.region}.amazonaws.com"
}

# The key policy lets the account administer the key and lets IAM policies in the
# account grant its use (the reader and writer policies below do, through S3 only).
# Actions are listed one by one rather than kms:*: nothing outside them is delegated.
data "aws_iam_policy_document" "archive_key" {
  # checkov:skip=CKV_AWS_109:A key policy's "*" resource is this key alone; the account root must be able to manage it (else the key is unmanageable).
  # checkov:skip=CKV_AWS_111:A key policy's "*" resource is this key alone; use is limited to S3 by kms:ViaService.
  # checkov:skip=CKV_AWS_356:A key policy's "*" resource is this key alone (AWS requires "*" there).
  statement {
    sid    = "AccountAdministersTheKey"
    effect = "Allow"
    principals {
      type        = "AWS"
      identifiers = [local.account_root]
    }
    actions = [
      "kms:CancelKeyDeletion",
      "kms:CreateAlias",
      "kms:DeleteAlias",
      "kms:DescribeKey",
      "kms:DisableKey",
      "kms:DisableKeyRotation",
      "kms:EnableKey",
      "kms:EnableKeyRotation",
      "kms:GetKeyPolicy",
      "kms:GetKeyRotationStatus",
      "kms:ListResourceTags",
      "kms:PutKeyPolicy",
      "kms:ScheduleKeyDeletion",
      "kms:TagResource",
      "kms:UntagResource",
      "kms:UpdateAlias",
      "kms:UpdateKeyDescription",
    ]
    # In a key policy "*" is this key.
    resources = ["*"]
  }

  statement {
    sid    = "IAMPoliciesMayGrantUseThroughS3"
    effect = "Allow"
    principals {
      type        = "AWS"
      identifiers = [local.account_root]
    }
    actions   = ["kms:Decrypt", "kms:Encrypt", "kms:GenerateDataKey"]
    resources = ["*"]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.s3_service]
    }
  }
}

resource "aws_kms_key" "archive" {
  description             = "SSE-KMS key of the vakpipe archive bucket ${var.bucket_name}"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.archive_key.json
  tags                    = var.tags
}

resource "aws_kms_alias" "archive" {
  name          = "alias/${var.bucket_name}"
  target_key_id = aws_kms_key.archive.key_id
}
