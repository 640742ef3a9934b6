# Two policies for vakpipe's jobs (attached to their IRSA role, var.job_role_names):
# read the archive, write the reports. Neither can change a byte of the archive.

locals {
  archive_objects = "${aws_s3_bucket.archive.arn}/${var.archive_prefix}/*"
  reports_objects = "${aws_s3_bucket.archive.arn}/${var.reports_prefix}/*"
}

data "aws_iam_policy_document" "archive_read" {
  statement {
    sid       = "ListTheArchivePrefixOnly"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.archive.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.archive_prefix}/", "${var.archive_prefix}/*"]
    }
  }

  statement {
    sid       = "ReadArchivedLedgers"
    effect    = "Allow"
    actions   = ["s3:GetObject"]
    resources = [local.archive_objects]
  }

  statement {
    sid       = "DecryptThroughS3"
    effect    = "Allow"
    actions   = ["kms:Decrypt"]
    resources = [aws_kms_key.archive.arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.s3_service]
    }
  }
}

data "aws_iam_policy_document" "reports_write" {
  statement {
    sid       = "ListTheReportsPrefixOnly"
    effect    = "Allow"
    actions   = ["s3:ListBucket"]
    resources = [aws_s3_bucket.archive.arn]
    condition {
      test     = "StringLike"
      variable = "s3:prefix"
      values   = ["${var.reports_prefix}/", "${var.reports_prefix}/*"]
    }
  }

  # A commit writes parts under _staging/, copies them into place (a copy reads its
  # source), deletes what the previous run left, and aborts an upload it gave up on.
  statement {
    sid    = "ReadWriteReports"
    effect = "Allow"
    actions = [
      "s3:AbortMultipartUpload",
      "s3:DeleteObject",
      "s3:GetObject",
      "s3:ListMultipartUploadParts",
      "s3:PutObject",
    ]
    resources = [local.reports_objects]
  }

  statement {
    sid       = "EncryptAndDecryptThroughS3"
    effect    = "Allow"
    actions   = ["kms:Decrypt", "kms:GenerateDataKey"]
    resources = [aws_kms_key.archive.arn]
    condition {
      test     = "StringEquals"
      variable = "kms:ViaService"
      values   = [local.s3_service]
    }
  }

  # Belt and braces: whatever else a role holding this policy is given, it cannot
  # change or remove an archived ledger, nor loosen a lock.
  statement {
    sid    = "NeverChangeTheArchive"
    effect = "Deny"
    actions = [
      "s3:BypassGovernanceRetention",
      "s3:DeleteObject",
      "s3:DeleteObjectVersion",
      "s3:PutObject",
      "s3:PutObjectLegalHold",
      "s3:PutObjectRetention",
    ]
    resources = [local.archive_objects]
  }
}

resource "aws_iam_policy" "archive_read" {
  name        = "${var.bucket_name}-archive-read"
  description = "vakpipe: list and read ${var.archive_prefix}/ of ${var.bucket_name}"
  policy      = data.aws_iam_policy_document.archive_read.json
  tags        = var.tags
}

resource "aws_iam_policy" "reports_write" {
  name        = "${var.bucket_name}-reports-write"
  description = "vakpipe: list, read, write and delete ${var.reports_prefix}/ of ${var.bucket_name}"
  policy      = data.aws_iam_policy_document.reports_write.json
  tags        = var.tags
}

resource "aws_iam_role_policy_attachment" "archive_read" {
  for_each   = toset(var.job_role_names)
  role       = each.value
  policy_arn = aws_iam_policy.archive_read.arn
}

resource "aws_iam_role_policy_attachment" "reports_write" {
  for_each   = toset(var.job_role_names)
  role       = each.value
  policy_arn = aws_iam_policy.reports_write.arn
}
