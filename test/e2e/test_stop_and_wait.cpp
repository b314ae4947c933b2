// placeholder: filled in by the issue 44 work
