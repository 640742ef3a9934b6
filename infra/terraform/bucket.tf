# The archive bucket: vak's ledgers under archive/, vakpipe's reports under reports/.
# Nobody rewrites history here: every object is versioned and each version is locked
# for var.retention_days; deleting an object only adds a delete marker.

resource "aws_s3_bucket" "archive" {
  bucket = var.bucket_name
  # Object lock can only be switched on when the bucket is created.
  object_lock_enabled = true
  tags                = var.tags
}

resource "aws_s3_bucket_ownership_controls" "archive" {
  bucket = aws_s3_bucket.archive.id
  rule {
    # ACLs off: access is decided by the policies below and nothing else.
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_public_access_block" "archive" {
  bucket                  = aws_s3_bucket.archive.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_versioning" "archive" {
  bucket = aws_s3_bucket.archive.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_object_lock_configuration" "archive" {
  bucket = aws_s3_bucket.archive.id
  rule {
    default_retention {
      mode = var.object_lock_mode
      days = var.retention_days
    }
  }
  depends_on = [aws_s3_bucket_versioning.archive]
}

resource "aws_s3_bucket_server_side_encryption_configuration" "archive" {
  bucket = aws_s3_bucket.archive.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.archive.arn
    }
    # One data key per bucket and time window instead of one KMS call per object:
    # an audit reads millions of objects.
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_logging" "archive" {
  bucket        = aws_s3_bucket.archive.id
  target_bucket = var.access_log_bucket
  target_prefix = "s3/${var.bucket_name}/"
}

resource "aws_s3_bucket_lifecycle_configuration" "archive" {
  bucket = aws_s3_bucket.archive.id

  rule {
    id     = "abort-incomplete-multipart-uploads"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
  }

  rule {
    id     = "archive-to-infrequent-access"
    status = "Enabled"
    filter {
      prefix = "${var.archive_prefix}/"
    }
    transition {
      days          = var.archive_infrequent_access_after_days
      storage_class = "STANDARD_IA"
    }
    # A replaced ledger version stays until its lock ends, then goes.
    noncurrent_version_expiration {
      noncurrent_days = var.retention_days + 1
    }
  }

  rule {
    id     = "reports-drop-old-versions"
    status = "Enabled"
    filter {
      prefix = "${var.reports_prefix}/"
    }
    # Each run replaces the previous one's files; their versions go once unlocked.
    noncurrent_version_expiration {
      noncurrent_days = var.retention_days + var.reports_noncurrent_days
    }
    expiration {
      expired_object_delete_marker = true
    }
  }

  depends_on = [aws_s3_bucket_versioning.archive]
}

# Deny, for everyone, any request that is not over TLS 1.2 or newer.
data "aws_iam_policy_document" "archive_bucket" {
  statement {
    sid    = "DenyInsecureTransport"
    effect = "Deny"
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.archive.arn,
      "${aws_s3_bucket.archive.arn}/*",
    ]
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }

  statement {
    sid    = "DenyOutdatedTLS"
    effect = "Deny"
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    actions = ["s3:*"]
    resources = [
      aws_s3_bucket.archive.arn,
      "${aws_s3_bucket.archive.arn}/*",
    ]
    condition {
      test     = "NumericLessThan"
      variable = "s3:TlsVersion"
      values   = ["1.2"]
    }
  }
}

resource "aws_s3_bucket_policy" "archive" {
  bucket = aws_s3_bucket.archive.id
  policy = data.aws_iam_policy_document.archive_bucket.json
  # A bucket policy put before the public access block could be judged public.
  depends_on = [aws_s3_bucket_public_access_block.archive]
}
