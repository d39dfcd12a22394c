#!/usr/bin/env bash
# The release path as an operator takes it, without an AWS account: the SAM
# CLI from PyPI in its own virtualenv (.venv-sam, apart from the app's .venv),
# then `sam validate --lint` (the SAM transform and cfn-lint) and `sam build`
# of template.yaml, which runs infra/build_lambda.sh for every function
# through the Makefile (BuildMethod makefile, build_in_source: no Docker).
# CI runs it after the tests (.ci/run); a broken template or build fails it.
#
#   bash infra/sam_check.sh
#   SAM_CLI_VERSION=1.170.0 SAM_PYTHON=python3.12 bash infra/sam_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# Pinned so that CI is reproducible; docs/deploy.md names the oldest that works.
SAM_CLI_VERSION="${SAM_CLI_VERSION:-1.170.0}"
SAM_PYTHON="${SAM_PYTHON:-python3}"  # any Python the SAM CLI supports (3.9+)
VENV=.venv-sam

# No AWS account is used, and no credentials are looked for: no telemetry, no
# instance-metadata probe; a region only because the CLI insists on one.
export SAM_CLI_TELEMETRY=0 AWS_EC2_METADATA_DISABLED=true
export AWS_DEFAULT_REGION="${AWS_DEFAULT_REGION:-${AWS_REGION:-eu-west-1}}"
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore

started=$(date +%s)
if [ ! -x "$VENV/bin/python" ]; then
  "$SAM_PYTHON" -m venv "$VENV"
fi
STAMP="$VENV/.aws-sam-cli-$SAM_CLI_VERSION"
if [ ! -f "$STAMP" ]; then
  echo "installing aws-sam-cli $SAM_CLI_VERSION into $VENV (from PyPI)"
  "$VENV/bin/python" -m pip install --quiet "aws-sam-cli==$SAM_CLI_VERSION"
  touch "$STAMP"
fi
SAM="$VENV/bin/sam"
"$SAM" --version

step() {
  local t
  echo; echo "\$ sam $*"
  t=$(date +%s)
  "$SAM" "$@"
  echo "(sam $1: $(( $(date +%s) - t )) s)"
}
step validate --lint --template-file template.yaml
step build --template-file template.yaml

# What sam build produced is what sam deploy would zip: one package per function.
"$VENV/bin/python" - "$(grep -c '^    Type: AWS::Serverless::Function$' template.yaml)" <<'PYTHON'
import os, sys
expected, build = int(sys.argv[1]), ".aws-sam/build"
functions = sorted(d for d in os.listdir(build) if os.path.isdir(os.path.join(build, d)))
incomplete = [
    f for f in functions
    if not all(os.path.isfile(os.path.join(build, f, *p))
               for p in (("memchat", "handlers", "chat.py"), ("run.sh",)))
]
if len(functions) != expected or incomplete:
    sys.exit(f"sam build: expected {expected} function packages, got {functions}"
             f" (without memchat or run.sh: {incomplete})")
print(f"sam build: {len(functions)} function packages in {build}: {', '.join(functions)}")
PYTHON
echo "SAM release path checked in $(( $(date +%s) - started )) s"
