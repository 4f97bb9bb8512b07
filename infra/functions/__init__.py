"""Lambda handlers, each a module of the standard library and boto3 only (the Lambda Python runtime has both);
infra/ ships each directory as the function's code asset."""
