terraform {
  # 1.9 for validations that refer to other variables; 1.7 for mock providers in tests/.
  required_version = ">= 1.9"

  required_providers {
    aws = {
      source  = "hashicorp/aws"
      version = ">= 5.40, < 7.0"
    }
  }
}
