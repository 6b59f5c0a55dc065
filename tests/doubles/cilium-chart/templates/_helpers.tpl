{{/*
An image reference as Cilium's chart makes it (its cilium.image helper): override, when set, is the whole reference;
otherwise repository:tag, with @digest when useDigest.
*/}}
{{- define "cilium.image" -}}
{{- if .override -}}
{{- .override -}}
{{- else -}}
{{- .repository }}:{{ .tag }}{{ if .useDigest }}@{{ .digest }}{{ end -}}
{{- end -}}
{{- end -}}
