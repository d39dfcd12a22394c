# `sam build` (template.yaml: Metadata BuildMethod: makefile) runs one target
# per function; all five share the package that infra/build_lambda.sh builds.
.PHONY: build-ChatFunction build-SessionsFunction build-ExportFunction build-CleanupFunction build-SummaryFunction
build-ChatFunction build-SessionsFunction build-ExportFunction build-CleanupFunction build-SummaryFunction:
	bash infra/build_lambda.sh --no-zip --out "$(ARTIFACTS_DIR)"
